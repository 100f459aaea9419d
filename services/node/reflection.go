package node

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Service names of the gRPC reflection and health services, for the
// authorization checks of the planes.
var (
	reflectionV1Name      = reflectionv1.ServerReflection_ServiceDesc.ServiceName
	reflectionV1AlphaName = reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName
)

// isReflection reports a service name of gRPC server reflection.
func isReflection(service string) bool {
	return service == reflectionV1Name || service == reflectionV1AlphaName
}

// registerReflection serves gRPC server reflection (v1 and v1alpha) on
// srv. It answers for the services registered on srv and the files they
// are defined in (with their imports), nothing else: not the other
// protocols linked into the binary (the cluster plane's Raft service, the
// admin service on the client plane), and no extensions. Register it after
// every other service of srv.
func registerReflection(srv *grpc.Server) {
	files := &planeFiles{srv: srv}
	opts := reflection.ServerOptions{Services: srv, DescriptorResolver: files, ExtensionResolver: &protoregistry.Types{}}
	reflectionv1.RegisterServerReflectionServer(srv, reflection.NewServerV1(opts))
	reflectionv1alpha.RegisterServerReflectionServer(srv, reflection.NewServer(opts))
}

// planeFiles resolves the descriptors of one gRPC server's services: the
// files that define them and the files those import, built on first use
// (when every service is registered).
type planeFiles struct {
	srv   *grpc.Server
	once  sync.Once
	files *protoregistry.Files
}

func (p *planeFiles) get() *protoregistry.Files {
	p.once.Do(func() { p.files = serviceFiles(p.srv.GetServiceInfo()) })
	return p.files
}

// FindFileByPath implements protodesc.Resolver.
func (p *planeFiles) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	return p.get().FindFileByPath(path)
}

// FindDescriptorByName implements protodesc.Resolver.
func (p *planeFiles) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	return p.get().FindDescriptorByName(name)
}

// serviceFiles collects the files defining services (looked up in the
// process's registry) and their imports.
func serviceFiles(services map[string]grpc.ServiceInfo) *protoregistry.Files {
	files := &protoregistry.Files{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if _, err := files.FindFileByPath(fd.Path()); err == nil {
			return
		}
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		if err := files.RegisterFile(fd); err != nil {
			// Two files of the process's registry conflict: leave this one
			// out rather than answer for it wrongly.
			return
		}
	}
	for name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			continue
		}
		add(d.ParentFile())
	}
	return files
}
